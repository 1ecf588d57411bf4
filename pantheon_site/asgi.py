"""ASGI entry point: `daphne pantheon_site.asgi:application`.

Model loading starts here, after django.setup(), in a background thread: not in
AppConfig.ready() (which also runs for `migrate` and every management command) and not
on ASGI lifespan events (which Daphne does not send). GET / answers while weights load.
"""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pantheon_site.settings")

import django  # noqa: E402

django.setup()

from channels.routing import ProtocolTypeRouter  # noqa: E402
from django.core.asgi import get_asgi_application  # noqa: E402

from inference.runtime import runtime  # noqa: E402

django_asgi_app = get_asgi_application()
runtime.start_loading()

application = ProtocolTypeRouter({"http": django_asgi_app})
