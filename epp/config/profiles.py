"""Scheduling profiles from the config: each profile's filters, weighted scorers and picker, and
the profile handler that runs them.

Defaults (spec §3.3): without ``schedulingProfiles`` one ``default`` profile holds every declared
filter, scorer and picker; ``max-score-picker`` is added when no picker is declared and
``single-profile-handler`` when no handler is; a scorer's weight is 1 unless given.

A config that declares no filter, scorer or picker at all (say, only a discovery source) would
route at random. It gets this EPP's built-in default scheduling instead (the plugins and weights
of ``DEFAULT_CONFIG_TEXT``'s profile), and the log says what was filled in. A profile that ends up
without any scorer is logged as a warning, naming it.

A profile may name a plugin with no scheduling role but another one (a data producer, an admitter,
a request hook), as llm-d's latency-predictor config names ``predicted-latency-producer``: it runs
in its own roles, is left out of the profile and logged as a warning (upstream's loader ignores it
silently). A plugin with no role at all, or one that fails a scheduling role's declaration, is
refused.
"""

from __future__ import annotations

import logging

from epp.config.builder import Builder
from epp.config.errors import ConfigError
from epp.config.schema import (
    EndpointPickerConfig,
    ProfilePluginRef,
    SchedulingProfileSpec,
)
from epp.plugin import (
    Admitter,
    DataProducer,
    Filter,
    Picker,
    PreRequest,
    Profile,
    ProfileHandler,
    ResponseComplete,
    ResponseHeaders,
    ResponseStreaming,
    Scorer,
)
from epp.plugin.conformance import explain_refusal, scheduling_roles

log = logging.getLogger(__name__)

_OTHER_ROLES = (
    DataProducer,
    Admitter,
    PreRequest,
    ResponseHeaders,
    ResponseStreaming,
    ResponseComplete,
)
"""Roles a plugin named in a profile may have instead of a scheduling one (it is left out)."""


def build_profiles(
    b: Builder, specs: tuple[SchedulingProfileSpec, ...], default: EndpointPickerConfig
) -> dict[str, Profile]:
    """The configured profiles; ``default`` is the built-in default config, whose scheduling fills
    in for a config that declares none."""
    if not specs:
        refs = tuple(
            ProfilePluginRef(name)
            for name, p in b.instances.items()
            if isinstance(p, (Filter, Scorer, Picker))
        )
        if not refs:
            refs = _default_scheduling(b, default)
        specs = (SchedulingProfileSpec(name="default", plugins=refs),)
    profiles = _profiles(b, specs)
    for name, profile in profiles.items():
        if not profile.scorers:
            log.warning(
                "scheduling profile %r has no scorer: its picker chooses among the filtered "
                "candidates without regard to load or cache affinity",
                name,
            )
    return profiles


def _default_scheduling(b: Builder, default: EndpointPickerConfig) -> tuple[ProfilePluginRef, ...]:
    """Add the built-in default's scheduling plugins (those its first profile names) under their
    default names, and return that profile's references."""
    specs = {spec.name or spec.type: spec for spec in default.plugins}
    refs: tuple[ProfilePluginRef, ...] = tuple(default.scheduling_profiles[0].plugins)
    for ref in refs:
        spec = specs[ref.plugin_ref]
        if ref.plugin_ref not in b.instances:
            b.add(spec.type, ref.plugin_ref, spec.parameters)
    log.info(
        "config declares no filter, scorer or picker; using the built-in default scheduling: %s",
        ", ".join(
            ref.plugin_ref + (f" (weight {ref.weight:g})" if ref.weight is not None else "")
            for ref in refs
        ),
    )
    return refs


def _profiles(b: Builder, specs: tuple[SchedulingProfileSpec, ...]) -> dict[str, Profile]:
    if not b.of(Picker):
        b.add("max-score-picker")
    first_picker = b.of(Picker)[0]
    profiles: dict[str, Profile] = {}
    for i, spec in enumerate(specs):
        where = f"schedulingProfiles[{i}]"
        if not spec.name:
            raise ConfigError(f"config: {where}.name: required")
        if spec.name in profiles:
            raise ConfigError(f"config: {where}.name: duplicate profile {spec.name!r}")
        filters: list[Filter] = []
        scorers: list[tuple[Scorer, float]] = []
        pickers: list[Picker] = []
        for j, ref in enumerate(spec.plugins):
            inst = b.ref(ref.plugin_ref, f"{where}.plugins[{j}]")
            roles = scheduling_roles(inst)
            if not roles:
                _not_scheduling(inst, ref.plugin_ref, spec.name, f"{where}.plugins[{j}]")
                continue
            if "filter" in roles:
                filters.append(inst)
            if "scorer" in roles:
                weight = 1.0 if ref.weight is None else float(ref.weight)
                if weight < 0:
                    raise ConfigError(f"config: {where}.plugins[{j}].weight: must be >= 0")
                scorers.append((inst, weight))
            if "picker" in roles:
                pickers.append(inst)
        if len(pickers) > 1:
            raise ConfigError(f"config: {where}: more than one picker in profile {spec.name!r}")
        picker = pickers[0] if pickers else first_picker
        profiles[spec.name] = Profile(spec.name, tuple(filters), tuple(scorers), picker)
    return profiles


def _not_scheduling(inst: object, ref: str, profile: str, where: str) -> None:
    """A profile names a plugin that is no filter, scorer or picker. One that tries to be one and
    fails is refused with the reason; any other plugin (a data producer, an admitter: llm-d's
    latency-predictor config lists ``predicted-latency-producer`` in its profile) runs in its own
    roles and is left out of the profile, as upstream's loader does, with a warning."""
    why = explain_refusal(inst)
    if why or not any(isinstance(inst, role) for role in _OTHER_ROLES):
        raise ConfigError(
            f"config: {where}: {ref!r} is not a filter, scorer or picker"
            + (f" ({why})" if why else "")
        )
    log.warning(
        "scheduling profile %r names %r, which is not a filter, scorer or picker: it runs in its "
        "own roles and is left out of the profile",
        profile,
        ref,
    )


def profile_handler(b: Builder, profiles: dict[str, Profile]) -> ProfileHandler:
    handlers = b.of(ProfileHandler)
    if len(handlers) > 1:
        names = ", ".join(h.typed_name.name for h in handlers)
        raise ConfigError(f"config: more than one profile handler ({names})")
    if not handlers:
        if len(profiles) != 1:
            raise ConfigError("config: several scheduling profiles need a profile handler plugin")
        return b.add("single-profile-handler")  # type: ignore[no-any-return]
    handler: ProfileHandler = handlers[0]
    if handler.typed_name.type == "single-profile-handler" and len(profiles) != 1:
        raise ConfigError("config: single-profile-handler needs exactly one scheduling profile")
    return handler
