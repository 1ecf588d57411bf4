"""What an exported session looks like on the wire (POST /admin/session/export and the
console's export action)."""

from __future__ import annotations

import base64


def export_body(exported) -> dict:
    """The body of POST /admin/session/export for an ExportedSession (the console's export
    action downloads the same)."""
    return {
        "session_id": exported.session_id,
        "namespace": exported.namespace,
        "weights_version": exported.weights_version,
        "n_tok": exported.n_tok,
        "blob_bytes": len(exported.blob),
        "blob_b64": base64.b64encode(exported.blob).decode("ascii"),
        "tokens": list(exported.tokens),
    }
