"""The admin dashboard (``/admin``) and its JSON API (``/admin/api``).

- ``pages``: the server-rendered pages and their POSTed forms (HTML); it includes
  ``login`` (login / logout, the static files)
- ``forms``: the session cookie a page needs, a form's CSRF check, the 303 back
- ``api``: the JSON API (session cookie plus ``X-CSRF-Token``, or a Bearer admin key)
- ``auth``: the signed session cookie, CSRF tokens, who is calling and what they may see
- ``params``: query-string paging and filters, shared by pages and API
- ``ops``: queries in a thread, the token decoder, the named actions (train-now, promote…)
- ``render``: the Jinja environment and the page response with its security headers
- ``queries``, ``charts``, ``templates/``, ``static/``: the data, SVG charts and markup
"""
