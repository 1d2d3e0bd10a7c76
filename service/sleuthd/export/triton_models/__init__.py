"""Triton Python-backend models that `sleuthd models triton-repo` copies into a repository as model.py."""
