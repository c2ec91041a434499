"""Authentication chains: authenticators a zone tries in order at CONNECT (EMQX's authentication chain).

Each authenticator answers allow, deny or ignore; ignore passes to the next, and when every one ignores,
the zone's users files and certificates decide as before. An authenticator that cannot answer (its key
set or service unreachable) denies: the chain fails closed.
"""
