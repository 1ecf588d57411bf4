"""ASGI entry point: `daphne pantheon_site.asgi:application`.

Model loading starts here, after django.setup(), in a background thread: not in
AppConfig.ready() (which also runs for `migrate` and every management command) and not
on ASGI lifespan events (which Daphne does not send). GET / answers while weights load.
The loader reads the database (operators.store): the models that were loaded when the
server stopped, or, in an empty database, PANTHEON_MODELS.
"""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pantheon_site.settings")

import django  # noqa: E402

django.setup()

from access.startup import check_bind  # noqa: E402

check_bind()  # a non-loopback bind with no API key: exit 2, saying why (access/startup.py)

from pantheon_site import daphne_hooks  # noqa: E402

# Before Daphne builds its HTTP factory: refuse before the body is spooled, the JSON error
# shape for malformed requests, Daphne's and Twisted's access logs off (daphne_hooks.py).
daphne_hooks.install()

from django.conf import settings  # noqa: E402

from kernels.devices import threads  # noqa: E402

# The engine owns the cores: one BLAS pool of PANTHEON_THREADS for every model, malloc
# arenas capped, before any model loads or server thread starts (kernels/devices/threads.py).
threads.configure(settings.PANTHEON_THREADS)

from kernels.cpu.backend import configure_activations  # noqa: E402

# float32 decode products unless the operator opted into bfloat16 (a CPU without AVX-512
# BF16 stays float32 and logs it; GET / says which).
configure_activations(settings.PANTHEON_ACTIVATIONS)

from pantheon_platform.request_memory import ASGIHandler  # noqa: E402
from pantheon_site import stack  # noqa: E402

# Django's handler (get_asgi_application's, after the setup above), less the reference
# cycle that kept every served request and its response until a full collection.
django_asgi_app = ASGIHandler()

from pantheon_platform import live_settings  # noqa: E402

# The runtime config an operator stored (PATCH /admin/config) wins over the environment
# from the first request and the first load on; read once here, in a sync context.
live_settings.refresh()

if settings.PANTHEON_ROLE == "router":
    # No engine: the client routes are forwarded to the registered instances (cluster/).
    from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

    from cluster.asgi import router_app

    application = stack.wrap(router_app(ASGIStaticFilesHandler(django_asgi_app)))
else:
    from cluster import heartbeat
    from observability import metrics, series
    from operators.store import DatabaseStore
    from pantheon_platform import gc_policy
    from pantheon_platform.runtime import get_runtime
    from sessions import persistence as session_persistence

    runtime = get_runtime()
    runtime.use_store(DatabaseStore())
    session_persistence.install(runtime)  # restore spilled sessions at load, spill at SIGTERM
    runtime.add_load_hook(gc_policy.freeze_long_lived)  # a loaded model's objects: frozen
    runtime.start_loading()
    from wire.batches import runner as batch_runner

    batch_runner.start()  # the Batches API's lines, in the engine's `batch` class
    series.start(metrics.scrape_registry())  # the console dashboard's points, every 2 s
    application = stack.build(django_asgi_app)
    heartbeat.install()  # with PANTHEON_ROUTER_URL: register, heartbeat, deregister at stop

from pantheon_platform import gc_policy, shutdown  # noqa: E402

# What start-up built lives as long as the process: out of the collector's way.
gc_policy.freeze_long_lived()

shutdown.install()  # SIGTERM: drain in-flight generations, then exit 0 (pantheon_platform/shutdown.py)

from observability import usage  # noqa: E402

usage.start_flusher()  # usage stats: buffered counts written every few seconds (observability/usage.py)
