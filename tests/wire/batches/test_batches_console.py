"""What an operator sees of batches: the console's list with a progress bar and a cancel
action, /admin/stats' batches section, and the `priority` extension field a live request
may send (the same answer, in the batch class)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from wire.batches.models import Batch, BatchLine

LIST = "/console/batches_api/batch/"


@pytest.fixture
def console(db, django_user_model) -> Client:
    user = django_user_model.objects.create_superuser("op", "op@example.com", "unused-pw")
    client = Client()
    client.force_login(user)
    return client


def a_batch(status: str = "in_progress", **counts) -> Batch:
    return Batch.objects.create(
        id="batch_0123456789abcdef",
        namespace="open",
        endpoint="/v1/chat/completions",
        input_file_id="file-x",
        status=status,
        expires_at=timezone.now() + timedelta(hours=24),
        **counts,
    )


def test_the_console_lists_batches_with_their_progress(console):
    a_batch(total=10, completed=3, failed=1)
    page = console.get(LIST).content.decode()
    assert "batch_0123456789abcdef" in page
    assert '<progress max="100" value="40"></progress> 4/10 (1 failed)' in page


def test_the_console_cancel_action_marks_the_batch_cancelling(console):
    batch = a_batch(total=2)
    reply = console.post(LIST, {"action": "cancel_batches", "_selected_action": [batch.id]})
    assert reply.status_code == 302
    batch.refresh_from_db()
    assert batch.status == "cancelling" and batch.cancelling_at is not None


def test_admin_stats_report_batches_and_their_open_lines(db):
    from wire.batches.progress import stats

    batch = a_batch(total=2)
    BatchLine.objects.create(batch=batch, index=0, custom_id="a", body={}, state="done")
    BatchLine.objects.create(batch=batch, index=1, custom_id="b", body={}, state="pending")
    assert stats() == {
        "batches": {"in_progress": 1},
        "open_lines": {"done": 1, "pending": 1},
    }
