"""The operator console: a small web page for what depositd cannot decide on its own.

Served by `serve` on `console.listen` (absent: none), inside the same process as the store, so
a retry from the console goes through the outbox exactly as one from the command line.

    auth     the login (token file, constant-time compare, throttle), sessions, CSRF, headers
    queries  what each page shows, read from the store in one read job
    pages    the GET pages (overview, timeline, lists, the hosted Travel Rule page)
    actions  the POST actions, each recorded with its time and note
    app      the application: routes, templates, static files, what it needs from `serve`
"""
