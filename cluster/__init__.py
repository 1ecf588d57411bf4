"""The scale-out app: the router role (PANTHEON_ROLE=router) in front of serve instances.

registry.py   the shared view in Redis: instances and their heartbeats, session and
              response affinity, drain flags (all with TTLs)
heartbeat.py  a serve instance's side: register, heartbeat, deregister at graceful stop
views.py      the router's own routes: /registry/*, /v1/models, /admin/instances, GET /
dispatch.py   the client routes, forwarded to the chosen instance (an ASGI app, streamed)
placement.py  which instance a request goes to (affinity, most free slots, full, none)
migration.py  draining an instance: its sessions moved through export -> restore
"""
