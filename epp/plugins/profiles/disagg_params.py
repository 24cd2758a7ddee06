"""Parameters of ``disagg-profile-handler``: the nested format and the deprecated flat one."""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields
from typing import Final, NamedTuple

DECODE_FIRST: Final = "decode-first"
PREFILL_FIRST: Final = "prefill-first"

_LEGACY: Final = {
    "decode_profile": ("decodeProfile", "profiles.decode"),
    "prefill_profile": ("prefillProfile", "profiles.prefill"),
    "encode_profile": ("encodeProfile", "profiles.encode"),
    "prefill_decider_plugin_name": ("prefillDeciderPluginName", "deciders.prefill"),
    "decider_plugin_name": ("deciderPluginName", "deciders.prefill"),
    "encode_decider_plugin_name": ("encodeDeciderPluginName", "deciders.encode"),
}


def parse_stage_order(text: str) -> str:
    """Upstream's ``ParseStageOrder``: case, ``-`` and ``_`` are ignored; ``""`` is decode-first."""
    key = text.replace("-", "").replace("_", "").lower()
    if key in ("", "decodefirst", "decode"):
        return DECODE_FIRST
    if key in ("prefillfirst", "prefill"):
        return PREFILL_FIRST
    raise ValueError(f"invalid stage order {text!r}, must be {DECODE_FIRST!r} or {PREFILL_FIRST!r}")


@dataclass(frozen=True)
class ProfileNames:
    decode: str = ""
    prefill: str = ""
    encode: str = ""


@dataclass(frozen=True)
class DeciderNames:
    prefill: str = ""
    encode: str = ""


class Effective(NamedTuple):
    """The parameters after defaults and the mapping of the flat format."""

    stage_order: str
    decode_profile: str
    prefill_profile: str
    encode_profile: str
    prefill_decider: str
    encode_decider: str


@dataclass(frozen=True)
class DisaggParams:
    """``stageOrder``, ``profiles.{decode,prefill,encode}``, ``deciders.{prefill,encode}``, or the
    deprecated flat fields (never both formats at once)."""

    stage_order: str = ""
    profiles: ProfileNames | None = None
    deciders: DeciderNames | None = None
    decode_profile: str | None = None
    prefill_profile: str | None = None
    encode_profile: str | None = None
    prefill_decider_plugin_name: str | None = None
    encode_decider_plugin_name: str | None = None
    decider_plugin_name: str | None = None

    def __post_init__(self) -> None:
        order = parse_stage_order(self.stage_order)
        if self.legacy_fields() and (self.profiles is not None or self.deciders is not None):
            raise ValueError(
                "use one format exclusively: either nested profiles/deciders or the deprecated "
                f"flat fields (found {', '.join(self.legacy_fields())})"
            )
        if order == PREFILL_FIRST and self.effective().prefill_decider:
            raise ValueError(f"prefill decider is not supported in {PREFILL_FIRST} stage order")

    def legacy_fields(self) -> list[str]:
        """YAML names of the flat fields present."""
        return [
            _LEGACY[f.name][0]
            for f in fields(self)
            if f.name in _LEGACY and getattr(self, f.name) is not None
        ]

    def effective(self) -> Effective:
        profiles = self.profiles or ProfileNames(
            self.decode_profile or "", self.prefill_profile or "", self.encode_profile or ""
        )
        deciders = self.deciders or DeciderNames(
            self.prefill_decider_plugin_name or self.decider_plugin_name or "",
            self.encode_decider_plugin_name or "",
        )
        return Effective(
            parse_stage_order(self.stage_order),
            profiles.decode or "decode",
            profiles.prefill or "prefill",
            profiles.encode or "encode",
            deciders.prefill,
            deciders.encode,
        )

    def log_deprecations(self, log: logging.Logger) -> None:
        """One line per flat field in use, as upstream."""
        if not self.legacy_fields():
            return
        log.info("Deprecated: using flat parameter format, migrate to nested profiles/deciders")
        for name, (old, new) in _LEGACY.items():
            if not getattr(self, name):
                continue
            if name == "decider_plugin_name" and self.prefill_decider_plugin_name:
                continue  # the lower-priority alias is ignored, as upstream
            log.info("Deprecated parameter %r, use %r instead", old, new)
