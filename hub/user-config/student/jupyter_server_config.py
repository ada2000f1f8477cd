"""A student's server on the course hub: the assignment list, not the instructor's tools."""
c = get_config()  # noqa: F821 - provided by Jupyter
c.ServerApp.jpserver_extensions = {
    "nbgrader.server_extensions.formgrader": False,
}
