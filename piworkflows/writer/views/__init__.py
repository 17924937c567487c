"""The read contract: run views and lists, computed from domain rows only."""
