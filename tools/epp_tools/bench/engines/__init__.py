"""``epp bench engines``: the ext_proc server's CPU per chunk and per request on libnghttp2,
hyper's ``h2`` and the previous hand-written HTTP/2 framing."""
