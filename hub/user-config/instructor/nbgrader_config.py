"""nbgrader for an instructor's server on the course hub. The server starts in the instructor's
course folder (hub/course_folder.py), whose nbgrader_config.py (read after this one) sets the
course root, the course's grader and the hub's exchange; this file only names the course."""
import os

c = get_config()  # noqa: F821 - provided by nbgrader
c.CourseDirectory.root = os.environ["COURSE_DIR"]
c.CourseDirectory.course_id = os.environ["COURSE_ID"]
c.Exchange.root = os.environ["COURSE_EXCHANGE"]
