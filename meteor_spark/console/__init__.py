"""``meteor console``: a small web console for one grid, served by the CLI (``meteor_spark.cli.console_cmd``).

app.py (routes, pages and JSON endpoints on Starlette), readmodel.py (what the pages show, gathered from the grid
through the functions the CLI uses), sampler.py (the thread sampling lag and rates), history.py (lag history and
rates, bounded), tail.py (the live tail's cursor reads), security.py (binding, token, actions), pages.py (HTML),
static/ (the page's script and stylesheet). Needs the ``console`` extra (starlette, uvicorn); nothing else imports
this package.
"""
