"""The HTTP app: what every route shares here (the error table, body parsing, encoding, API
keys, middleware, metrics, logging, read deadlines, `engine_calls`), the routes in `dialects/`
(a module per wire dialect), `status_routes` (models, health, metrics) and `admin_routes`, and
above them `app/`, the one factory (`create_app`) that every target serves. Nothing here
imports `app`, so the lighter modules (logging, read deadlines) do not load the whole app.

Route handlers are short, with no try/except: errors reach the one table in `errors.py`."""
