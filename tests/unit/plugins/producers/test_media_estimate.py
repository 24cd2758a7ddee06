"""token-producer's media estimates: upstream's formulas, its parameters and the video headers."""

from __future__ import annotations

import base64
import io
from typing import Any

import pytest

from epp.plugin import RequestBody
from epp.plugin.params import ParamError, decode
from epp.plugins.producers.media_estimate import (
    MediaEstimate,
    VideoMeta,
    audio_tokens,
    base64_image_size,
    data_url_size,
    video_meta,
)
from epp.plugins.producers.tokens import TokenProducer, estimate
from tests.builders import handle, make_request

PIL = pytest.importorskip("PIL.Image")


def _encoded(fmt: str, size: tuple[int, int], **save: Any) -> str:
    buf = io.BytesIO()
    PIL.new("RGB", size, (200, 30, 30)).save(buf, format=fmt, **save)
    return base64.b64encode(buf.getvalue()).decode()


def _media(**params: Any) -> MediaEstimate:
    return decode(MediaEstimate, params)


@pytest.mark.parametrize(
    ("fmt", "save"),
    [
        pytest.param("PNG", {}, id="png"),
        pytest.param("GIF", {}, id="gif"),
        pytest.param("JPEG", {}, id="jpeg"),
        pytest.param("JPEG", {"progressive": True}, id="jpeg-progressive"),
        # EXIF before the frame header: the walk must skip segments to find it.
        pytest.param("JPEG", {"exif": b"Exif\0\0" + b"\0" * 3000}, id="jpeg-exif"),
    ],
)
def test_image_size_read_from_header_when_base64_image(fmt: str, save: dict[str, Any]) -> None:
    payload = _encoded(fmt, (1280, 720), **save)
    assert base64_image_size(payload) == (1280, 720)
    assert data_url_size(f"data:image/{fmt.lower()};base64,{payload}") == (1280, 720)


@pytest.mark.parametrize(
    "url",
    [
        pytest.param("https://example.com/cat.png", id="remote"),
        pytest.param("data:image/png;base64,!!!not-base64", id="bad-base64"),
        pytest.param("data:image/png;base64," + base64.b64encode(b"GIF8").decode(), id="short"),
        pytest.param("data:image/png," + "x" * 10, id="not-base64-url"),
        pytest.param("data:text/plain;base64,aGVsbG8=", id="not-image"),
        pytest.param(
            "data:image/jpeg;base64," + base64.b64encode(b"\xff\xd8\xff\xe0\x00\x01").decode(),
            id="jpeg-bad-length",
        ),
    ],
)
def test_image_size_unknown_when_not_decodable(url: str) -> None:
    assert data_url_size(url) is None


def test_image_tokens_follow_upstream_defaults() -> None:
    image = MediaEstimate().image
    assert image.tokens(None) == 640 * 360 // 1024 == 225
    assert image.tokens((1280, 720)) == 900
    assert image.tokens((10, 10)) == 1  # never 0: every image weighs


def test_image_tokens_follow_parameters() -> None:
    dynamic = _media(
        image={"defaultResolution": {"width": 1280, "height": 720}, "dynamic": {"factor": 256}}
    )
    assert dynamic.image.tokens(None) == 3600
    assert dynamic.image.tokens((512, 512)) == 1024
    static = _media(image={"mode": "static", "static": {"staticToken": 77}})
    assert static.image.tokens((4000, 4000)) == 77
    assert _media(image={"mode": "static"}).image.tokens(None) == 1


def test_video_tokens_follow_upstream_defaults() -> None:
    assert MediaEstimate().video.tokens(VideoMeta()) == 10 * 2 * 225


def test_video_tokens_qwen3_shape() -> None:
    """Dynamic tokens per frame, sampled frames merged by pairs, capped."""
    video = _media(
        video={
            "tokensPerFrame": {"mode": "dynamic", "dynamic": {"factor": 1024}},
            "frames": {
                "mode": "sampled",
                "maxFrames": 30,
                "sampled": {"sampleFPS": 2, "temporalPatchSize": 2},
            },
        }
    ).video
    # 20 s at 2 fps = 40 frames, capped to 30, merged by 2 = 15 groups of 1280x720/1024 = 900.
    assert video.tokens(VideoMeta(width=1280, height=720, seconds=20)) == 15 * 900
    assert video.tokens(VideoMeta(seconds=1)) == 1 * 225  # 2 frames -> 1 group


def test_video_tokens_gemma4_shape() -> None:
    """Static tokens per frame, strided frames from the source rate, overall cap."""
    video = _media(
        video={
            "tokensPerFrame": {"mode": "static", "static": {"numTokensPerFrame": 256}},
            "frames": {"mode": "strided", "minFrames": 4, "strided": {"frameStride": 12}},
            "maxVideoTokens": 5000,
            "defaultDuration": 2,
        }
    ).video
    assert video.tokens(VideoMeta()) == 4 * 256  # 2 s x 24 fps / 12 = 4 frames
    assert video.tokens(VideoMeta(fps=6)) == 4 * 256  # 1 frame, floored to 4
    assert video.tokens(VideoMeta(seconds=60, fps=30)) == 5000  # 150 frames, capped


def test_video_meta_read_from_headers_and_bad_values_ignored() -> None:
    assert video_meta(
        {
            "x-llm-d-video-duration-seconds": "12.5",
            "x-llm-d-video-resolution": "1920x1080",
            "x-llm-d-video-fps": "30",
        }
    ) == VideoMeta(width=1920, height=1080, seconds=12.5, fps=30.0)
    bad = {
        "x-llm-d-video-duration-seconds": "-3",
        "x-llm-d-video-resolution": "wide",
        "x-llm-d-video-fps": "nan",
    }
    assert video_meta(bad) == VideoMeta()


def test_audio_tokens_from_payload_size() -> None:
    assert audio_tokens("") == 14 + 125
    assert audio_tokens("A" * 64000) == 14 + int(12.5 * 3)  # 48 kB = 3 s


@pytest.mark.parametrize(
    ("params", "match"),
    [
        pytest.param({"image": {"mode": "huge"}}, "image.mode: must be one of", id="image-mode"),
        pytest.param({"video": {"frames": {"mode": "all"}}}, "frames.mode", id="frames-mode"),
        pytest.param(
            {"image": {"defaultResolution": {"width": -1, "height": 2}}},
            "width must be >= 0",
            id="negative",
        ),
        pytest.param({"image": {"dynamic": {"factr": 2}}}, "did you mean 'factor'", id="typo"),
    ],
)
def test_media_params_rejected_when_invalid(params: dict[str, Any], match: str) -> None:
    with pytest.raises(ParamError, match=match):
        decode(MediaEstimate, params)


def _chat_with(block: dict[str, Any]) -> RequestBody:
    payload = {"messages": [{"role": "user", "content": [block]}]}
    return RequestBody(kind="chat", payload=payload, raw=b"")


def _media_tokens(prompt_ids: list[int]) -> int:
    return len(prompt_ids) - 1  # "user" is one pseudo-token


def test_estimate_sizes_a_data_url_image_by_its_pixels() -> None:
    url = "data:image/png;base64," + _encoded("PNG", (1024, 1024))
    prompt = estimate(_chat_with({"type": "image_url", "image_url": {"url": url}}))
    assert prompt is not None
    assert _media_tokens(list(prompt.token_ids())) == 1024


def test_estimate_sizes_an_anthropic_base64_image_by_its_pixels() -> None:
    source = {"type": "base64", "media_type": "image/jpeg", "data": _encoded("JPEG", (2048, 512))}
    body = RequestBody(
        kind="anthropic-messages",
        payload={"messages": [{"role": "user", "content": [{"type": "image", "source": source}]}]},
        raw=b"",
    )
    prompt = estimate(body)
    assert prompt is not None
    assert _media_tokens(list(prompt.token_ids())) == 1024


async def test_producer_uses_estimate_params_and_video_headers() -> None:
    params = decode(
        TokenProducer.Params,
        {
            "estimate": {
                "video": {"tokensPerFrame": {"mode": "static", "static": {"numTokensPerFrame": 10}}}
            }
        },
    )
    producer = TokenProducer(name="", params=params, handle=handle())
    body = _chat_with({"type": "video_url", "video_url": {"url": "https://example.com/v.mp4"}})
    request = make_request(body=body, headers={"x-llm-d-video-duration-seconds": "3"})
    await producer.produce(request, [])
    prompt = request.attributes["TokenizedPrompt/token-producer"]
    assert _media_tokens(list(prompt.token_ids())) == 3 * 2 * 10


@pytest.mark.parametrize(
    ("params", "backend"),
    [
        pytest.param({}, "estimate", id="nothing-set"),
        pytest.param({"estimate": {}}, "estimate", id="estimate-block"),
        pytest.param({"modelName": "m"}, "vllm", id="model-name-implies-vllm"),
        pytest.param(
            {"modelName": "m", "vllm": {"url": "http://127.0.0.1:1"}}, "vllm", id="vllm-block"
        ),
        pytest.param({"backend": "estimate", "modelName": "m"}, "estimate", id="explicit-estimate"),
        pytest.param(
            {"backend": "vllm", "modelName": "m", "estimate": {"image": {"mode": "static"}}},
            "vllm",
            id="explicit-vllm-tunes-fallback",
        ),
    ],
)
def test_backend_selected_as_upstream_when_not_named(params: dict[str, Any], backend: str) -> None:
    assert decode(TokenProducer.Params, params).selected == backend


@pytest.mark.parametrize(
    ("params", "match"),
    [
        pytest.param({"vllm": {}}, "modelName is required", id="vllm-without-model"),
        pytest.param({"modelName": "m", "estimate": {}}, "only one of 'estimate'", id="both"),
    ],
)
def test_backend_params_rejected_when_contradictory(params: dict[str, Any], match: str) -> None:
    with pytest.raises(ParamError, match=match):
        decode(TokenProducer.Params, params)
