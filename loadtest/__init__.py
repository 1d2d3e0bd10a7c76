"""Load generation against a sleuthd server (locust); see README.md."""
