"""nbgrader for a student's server on the course hub: the hub's exchange (fetch, submit, feedback).
The hub sets COURSE_EXCHANGE and COURSE_ID (hub/jupyterhub_config.py, from hub/site.toml)."""
import os

c = get_config()  # noqa: F821 - provided by nbgrader
c.Exchange.root = os.environ["COURSE_EXCHANGE"]
c.CourseDirectory.course_id = os.environ["COURSE_ID"]
