"""The HTTP app: what every route shares here (the error table, body parsing, encoding, API
keys, middleware, metrics, logging, read deadlines), the routes in `dialects/` (a module per
wire dialect) and `routes/`, and above them `app/`, the one factory (`create_app`) that
every target serves. Nothing here imports `app`, so the lighter modules (logging, read
deadlines) do not load the whole app."""
