"""RunPolicy and Profile objects served live: the watch that mirrors them into the
policy directory (``watch``) and its process as the server runs it (``process``)."""
