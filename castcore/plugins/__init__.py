"""Plugins: the hooks, the claim tables packs fill, loading (entry points, custom-op files), who answers, the audit."""
