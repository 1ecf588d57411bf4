"""The router's console page (/console/instances/): the live instances as GET
/admin/instances shows them, behind the console's own login (admin.site.admin_view)."""

from __future__ import annotations

import time

from django.contrib import admin
from django.template.response import TemplateResponse

from cluster.registry import get_registry
from cluster.views import instance_row


def instances_page(request):
    rows = [instance_row(i, time.time()) for i in get_registry().instances()]
    context = {**admin.site.each_context(request), "title": "Serve instances", "rows": rows}
    return TemplateResponse(request, "cluster/instances.html", context)


page = admin.site.admin_view(instances_page)
