"""Plugins: the hooks, the claim tables packs fill, loading (entry points, custom-op files), who answers, the
plugin host (one configuration's plugins and devices, castcore.plugins.host), the audit."""
