"""How a PostgreSQL registry URL may be shown to an operator: without its password, on one line.

`sleuthd serve --registry postgresql://...` that cannot reach its database stops with one line naming the
URL (password removed) and what to check, instead of psycopg's multi-line message under a traceback.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

_HIDDEN = "***"


def redact_url(url: str) -> str:
    """``url`` with the password of its user part and any ``password=`` parameter replaced by ``***``."""
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError for a port that is not a number
    except ValueError:
        return f"{url.split('://', 1)[0]}://{_HIDDEN} (not a valid URL)"
    netloc = parts.netloc
    if parts.password is not None:
        user = f"{parts.username}:{_HIDDEN}@" if parts.username else f":{_HIDDEN}@"
        host = parts.hostname or ""
        if ":" in host:  # an IPv6 address keeps its brackets
            host = f"[{host}]"
        netloc = user + host + (f":{port}" if port is not None else "")
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(k == "password" for k, _ in pairs):
            query = urlencode([(k, _HIDDEN if k == "password" else v) for k, v in pairs], safe="/*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def secrets_of(url: str) -> list[str]:
    """The password strings in ``url`` (user part and ``password=``), to scrub from messages that echo them."""
    try:
        parts = urlsplit(url)
        found = [parts.password] if parts.password else []
        found += [v for k, v in parse_qsl(parts.query, keep_blank_values=True) if k == "password" and v]
    except ValueError:
        return []
    return found


def unreachable_message(url: str, cause: BaseException) -> str:
    """One line for a registry that failed while the server starts: where, why, what to check."""
    # psycopg's own error when there is one (the RegistryUnavailable wrapping it only adds our wording);
    # its messages span lines ("...Connection refused\n\tIs the server running on that host ...").
    detail = " ".join(str(cause.__cause__ or cause).split())
    for secret in secrets_of(url):
        detail = detail.replace(secret, _HIDDEN)
    return (
        f"voice registry {redact_url(url)} cannot be used: {detail} -- check that PostgreSQL runs at that host "
        "and port and accepts connections from this machine, that the database and user exist, and the "
        "password (~/.pgpass or PGPASSWORD; docs/registry.md)"
    )
