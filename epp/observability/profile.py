"""``--enable-pprof``: a CPU profile of the event loop, Python's answer to Go's
``/debug/pprof/profile``.

``GET /debug/pprof/profile?seconds=N`` profiles the App's event-loop thread (where every request,
plugin and background task of the App runs) with ``cProfile`` for ``N`` seconds (default 30, 1 to
``MAX_SECONDS``) and answers with the ``pstats`` file (``application/octet-stream``; open it with
``python -m pstats`` or snakeviz); ``&format=text`` answers with the top ``TEXT_ROWS`` functions
by cumulative time instead. One profile at a time: a second request while one runs gets 409.
Go's heap, goroutine and trace profiles have no counterpart here. The path sits behind the
metrics port's auth, and ``--enable-debug-endpoints=false`` removes it with the other views.
"""

from __future__ import annotations

import asyncio
import cProfile
import io
import marshal
import pstats
from typing import Final

from aiohttp import web

DEFAULT_SECONDS: Final = 30
MAX_SECONDS: Final = 300
TEXT_ROWS: Final = 60


class Profiler:
    def __init__(self) -> None:
        self._busy = False

    async def profile(self, request: web.Request) -> web.Response:
        try:
            seconds = int(request.query.get("seconds", str(DEFAULT_SECONDS)))
        except ValueError:
            return web.Response(status=400, text="seconds must be an integer\n")
        if not 1 <= seconds <= MAX_SECONDS:
            return web.Response(status=400, text=f"seconds must be 1..{MAX_SECONDS}\n")
        if self._busy:
            return web.Response(status=409, text="a profile is already being taken\n")
        self._busy = True
        profiler = cProfile.Profile()
        try:
            profiler.enable()
            try:
                await asyncio.sleep(seconds)
            finally:
                profiler.disable()
        finally:
            self._busy = False
        if request.query.get("format") == "text":
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(TEXT_ROWS)
            return web.Response(text=out.getvalue())
        profiler.create_stats()
        body = marshal.dumps(profiler.stats)
        return web.Response(
            body=body,
            content_type="application/octet-stream",
            headers={"Content-Disposition": 'attachment; filename="profile.pstats"'},
        )
