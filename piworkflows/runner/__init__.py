"""Runner children: the only processes that execute workflow code."""
