"""API keys and the browser defences: who may call which route (pantheon_platform.routes).

guard.py    AccessGuard, the ASGI layer (pantheon_site.stack) that checks every HTTP request
keys.py     env keys and console keys (hashed in the database) -> a Principal with scopes
models.py   ApiKey, a key made in the console (/console/): only its sha256 is stored
admin.py    the console's key list, the add form that shows a new key once, revoke
startup.py  check_bind: refuse a non-loopback bind with no key configured
"""
