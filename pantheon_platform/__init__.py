"""The platform every app shares (see DESIGN.md, Layout)."""
