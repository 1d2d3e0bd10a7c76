"""The command line: `sleuthd serve|check|rank|health|models` (the outermost layer; a client or the server)."""
