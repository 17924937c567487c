"""Client-side live views: watches of run views and of the run list."""
