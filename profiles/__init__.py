"""Deployment profiles: named, declarative TOML files (one per deployment target), the schema
that reads them (profile.py) and the memory planner (planner.py)."""

from specx.profiles.profile import (
    DIMS,
    PRECISIONS,
    PROVIDERS,
    Profile,
    ProfileError,
    Range,
    ShapeProfile,
    TensorRTSettings,
    builtin_names,
    load_profile,
    parse_profile,
    validate,
)

__all__ = [
    "DIMS",
    "PRECISIONS",
    "PROVIDERS",
    "Profile",
    "ProfileError",
    "Range",
    "ShapeProfile",
    "TensorRTSettings",
    "builtin_names",
    "load_profile",
    "parse_profile",
    "validate",
]
