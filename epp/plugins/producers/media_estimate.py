"""How many placeholder tokens the ``estimate`` backend of ``token-producer`` gives a media item.

A model server expands every image, video or audio clip of a prompt into a run of placeholder
tokens; prefix matching and token counts need the length of that run without decoding the media.
These are upstream's estimates (``token-producer``'s ``estimate`` parameters), with the same
defaults:

- **image**, mode ``dynamic`` (default): ``max(1, width * height // factor)``, ``factor`` 1024. The
  dimensions are read from the header of a ``data:image/...;base64,`` URL (or an Anthropic base64
  source) when it is a PNG, GIF or JPEG; otherwise ``defaultResolution`` (640x360, so 225 tokens).
  Mode ``static``: ``static.staticToken`` per image (1 when unset).
- **video**: ``max(1, min(frames * tokensPerFrame, maxVideoTokens))``.
  - ``tokensPerFrame``, mode ``dynamic`` (default): ``width * height // factor`` (factor 1024) of
    the ``x-llm-d-video-resolution`` header (``WIDTHxHEIGHT``), else ``defaultResolution``
    (640x360); mode ``static``: ``static.numTokensPerFrame``.
  - ``frames``, mode ``sampled`` (default): ``clamp(duration * sampleFPS, minFrames, maxFrames) //
    temporalPatchSize`` (``sampleFPS`` 2, no merge below 2); mode ``strided``:
    ``clamp(duration * sourceFPS // frameStride, minFrames, maxFrames)``, the source rate from the
    ``x-llm-d-video-fps`` header, else ``strided.defaultSourceFPS`` (24). The duration comes from
    ``x-llm-d-video-duration-seconds``, else ``defaultDuration`` (10 s). A zero bound is no bound.
- **audio** (not configurable upstream either): ``14 + int(12.5 * seconds)``, the seconds from the
  base64 payload's size at 16 kB/s, 10 s when there is none.

With no ``estimate`` parameters an image is 225 tokens and a video 4,500 (20 frames of 225).

YAML (llm-d's multimodal latency guide)::

    - type: token-producer
      parameters:
        estimate:
          image:
            mode: dynamic
            defaultResolution: {width: 1280, height: 720}
            dynamic: {factor: 1024}
          video:
            tokensPerFrame: {mode: static, static: {numTokensPerFrame: 256}}
            frames: {mode: strided, maxFrames: 32, strided: {frameStride: 12}}
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

DEFAULT_WIDTH: Final = 640
DEFAULT_HEIGHT: Final = 360
DEFAULT_FACTOR: Final = 1024
DEFAULT_VIDEO_SECONDS: Final = 10.0
DEFAULT_SAMPLE_FPS: Final = 2.0
DEFAULT_SOURCE_FPS: Final = 24.0
AUDIO_OVERHEAD_TOKENS: Final = 14
AUDIO_TOKENS_PER_SECOND: Final = 12.5
AUDIO_BYTES_PER_SECOND: Final = 16000
AUDIO_DEFAULT_SECONDS: Final = 10.0

VIDEO_DURATION_HEADER: Final = "x-llm-d-video-duration-seconds"
VIDEO_RESOLUTION_HEADER: Final = "x-llm-d-video-resolution"
VIDEO_FPS_HEADER: Final = "x-llm-d-video-fps"

# An image header is in the first few hundred bytes, except a JPEG's, whose frame header can
# follow EXIF and ICC segments: decode at most this much base64 to find it.
_HEADER_B64_CHARS: Final = 64 * 1024


def _non_negative(owner: str, **values: float) -> None:
    for key, value in values.items():
        if value < 0:
            raise ValueError(f"{owner}.{key} must be >= 0, got {value}")


@dataclass(frozen=True)
class Resolution:
    width: int = 0
    height: int = 0

    def __post_init__(self) -> None:
        _non_negative("resolution", width=self.width, height=self.height)


@dataclass(frozen=True)
class PixelFactor:
    factor: int = 0

    def __post_init__(self) -> None:
        _non_negative("dynamic", factor=self.factor)


@dataclass(frozen=True)
class StaticImage:
    static_token: int = 0


@dataclass(frozen=True)
class ImageEstimate:
    mode: Literal["", "dynamic", "static"] = ""
    default_resolution: Resolution | None = None
    static: StaticImage | None = None
    dynamic: PixelFactor | None = None

    def tokens(self, size: tuple[int, int] | None) -> int:
        """Placeholders for an image of ``size`` (width, height), or of the default when None."""
        if self.mode == "static":
            return max(1, self.static.static_token if self.static else 0)
        if size is None:
            size = _resolution(self.default_resolution)
        factor = (self.dynamic.factor if self.dynamic else 0) or DEFAULT_FACTOR
        return max(1, size[0] * size[1] // factor)


@dataclass(frozen=True)
class StaticFrame:
    num_tokens_per_frame: int = 0


@dataclass(frozen=True)
class TokensPerFrame:
    mode: Literal["", "dynamic", "static"] = ""
    static: StaticFrame | None = None
    dynamic: PixelFactor | None = None


@dataclass(frozen=True)
class SampledFrames:
    sample_fps: float = field(default=0.0, metadata={"yaml": "sampleFPS"})
    temporal_patch_size: int = 0

    def __post_init__(self) -> None:
        _non_negative("sampled", sampleFPS=self.sample_fps)


@dataclass(frozen=True)
class StridedFrames:
    default_source_fps: float = field(default=0.0, metadata={"yaml": "defaultSourceFPS"})
    frame_stride: int = 0

    def __post_init__(self) -> None:
        _non_negative("strided", defaultSourceFPS=self.default_source_fps)


@dataclass(frozen=True)
class Frames:
    mode: Literal["", "sampled", "strided"] = ""
    min_frames: int = 0
    max_frames: int = 0
    sampled: SampledFrames | None = None
    strided: StridedFrames | None = None

    def __post_init__(self) -> None:
        _non_negative("frames", minFrames=self.min_frames, maxFrames=self.max_frames)


@dataclass(frozen=True)
class VideoMeta:
    """What a request's ``x-llm-d-video-*`` headers say of its videos (0: not said)."""

    width: int = 0
    height: int = 0
    seconds: float = 0.0
    fps: float = 0.0


@dataclass(frozen=True)
class VideoEstimate:
    default_resolution: Resolution | None = None
    default_duration: float = 0.0
    tokens_per_frame: TokensPerFrame | None = None
    frames: Frames | None = None
    max_video_tokens: int = 0

    def __post_init__(self) -> None:
        _non_negative(
            "video", defaultDuration=self.default_duration, maxVideoTokens=self.max_video_tokens
        )

    def tokens(self, meta: VideoMeta) -> int:
        n = self.frame_count(meta) * self.per_frame(meta)
        if self.max_video_tokens > 0:
            n = min(n, self.max_video_tokens)
        return max(1, n)

    def frame_count(self, meta: VideoMeta) -> int:
        frames = self.frames or Frames()
        seconds = meta.seconds or self.default_duration or DEFAULT_VIDEO_SECONDS
        if frames.mode == "strided":
            strided = frames.strided or StridedFrames()
            fps = meta.fps or strided.default_source_fps or DEFAULT_SOURCE_FPS
            n = int(seconds * fps) // max(1, strided.frame_stride)
            return _clamp(n, frames.min_frames, frames.max_frames)
        # The sampling rate is the model processor's, not the source's: no header overrides it.
        sampled = frames.sampled or SampledFrames()
        n = _clamp(
            int(seconds * (sampled.sample_fps or DEFAULT_SAMPLE_FPS)),
            frames.min_frames,
            frames.max_frames,
        )
        return n // sampled.temporal_patch_size if sampled.temporal_patch_size > 1 else n

    def per_frame(self, meta: VideoMeta) -> int:
        tpf = self.tokens_per_frame or TokensPerFrame()
        if tpf.mode == "static":
            return max(1, tpf.static.num_tokens_per_frame if tpf.static else 0)
        if meta.width > 0 and meta.height > 0:
            width, height = meta.width, meta.height
        else:
            width, height = _resolution(self.default_resolution)
        factor = (tpf.dynamic.factor if tpf.dynamic else 0) or DEFAULT_FACTOR
        return max(1, width * height // factor)


@dataclass(frozen=True)
class MediaEstimate:
    """``token-producer``'s ``estimate`` parameters."""

    image: ImageEstimate = field(default_factory=ImageEstimate)
    video: VideoEstimate = field(default_factory=VideoEstimate)


def _resolution(configured: Resolution | None) -> tuple[int, int]:
    width = configured.width if configured and configured.width > 0 else DEFAULT_WIDTH
    height = configured.height if configured and configured.height > 0 else DEFAULT_HEIGHT
    return width, height


def _clamp(n: int, low: int, high: int) -> int:
    if low > 0:
        n = max(n, low)
    if high > 0:
        n = min(n, high)
    return n


def audio_tokens(data: str) -> int:
    seconds = len(data) * 3 / 4 / AUDIO_BYTES_PER_SECOND if data else AUDIO_DEFAULT_SECONDS
    return max(1, AUDIO_OVERHEAD_TOKENS + int(AUDIO_TOKENS_PER_SECOND * seconds))


def video_meta(headers: Mapping[str, str]) -> VideoMeta:
    """The ``x-llm-d-video-*`` headers; a value that does not parse (or is not > 0) is not said."""
    width = height = 0
    resolution = headers.get(VIDEO_RESOLUTION_HEADER, "")
    w, sep, h = resolution.strip().lower().partition("x")
    if sep and w.isdigit() and h.isdigit():
        width, height = int(w), int(h)
    return VideoMeta(
        width=width,
        height=height,
        seconds=_positive(headers.get(VIDEO_DURATION_HEADER)),
        fps=_positive(headers.get(VIDEO_FPS_HEADER)),
    )


def _positive(text: str | None) -> float:
    if not text:
        return 0.0
    try:
        value = float(text)
    except ValueError:
        return 0.0
    return value if 0 < value < float("inf") else 0.0


def data_url_size(url: str) -> tuple[int, int] | None:
    """The pixel size of a ``data:image/...;base64,`` URL's image, or None."""
    if not url.startswith("data:image/"):
        return None
    marker = url.find("base64,")
    if marker < 0:
        return None
    return base64_image_size(url[marker + 7 :])


def base64_image_size(payload: str) -> tuple[int, int] | None:
    """The pixel size of a base64 PNG, GIF or JPEG, read from its header, or None."""
    chunk = payload[:_HEADER_B64_CHARS]
    chunk = chunk[: len(chunk) // 4 * 4]
    try:
        head = base64.b64decode(chunk, validate=True)
    except (binascii.Error, ValueError):
        return None
    size = _png_size(head) or _gif_size(head) or _jpeg_size(head)
    return size if size and size[0] > 0 and size[1] > 0 else None


def _png_size(head: bytes) -> tuple[int, int] | None:
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR" or len(head) < 24:
        return None
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def _gif_size(head: bytes) -> tuple[int, int] | None:
    if head[:6] not in (b"GIF87a", b"GIF89a") or len(head) < 10:
        return None
    return int.from_bytes(head[6:8], "little"), int.from_bytes(head[8:10], "little")


# JPEG start-of-frame markers (baseline, progressive, lossless, ...): not DHT, JPG or DAC.
_SOF_MARKERS: Final = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def _jpeg_size(head: bytes) -> tuple[int, int] | None:
    if head[:2] != b"\xff\xd8":
        return None
    i = 2
    # Each step skips one whole segment, so the walk ends within len(head) / 4 steps.
    while i + 4 <= len(head):
        if head[i] != 0xFF:
            return None
        marker = head[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD8)):  # markers without a length
            i += 2
            continue
        length = int.from_bytes(head[i + 2 : i + 4], "big")
        if length < 2:
            return None
        if marker in _SOF_MARKERS:
            if i + 9 > len(head):
                return None
            return int.from_bytes(head[i + 7 : i + 9], "big"), int.from_bytes(
                head[i + 5 : i + 7], "big"
            )
        i += 2 + length
    return None
