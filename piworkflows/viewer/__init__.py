"""``pi-workflows view``: the terminal viewer of live views (Textual)."""
