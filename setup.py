"""Package discovery: every package below the four layer folders, as a subpackage of specx.

pyproject.toml maps each layer folder to its specx package (``[tool.setuptools.package-dir]``);
pyproject's own ``packages.find`` cannot prefix what it finds, hence this file. A new folder with
an ``__init__.py`` ships without further edits.
"""

from setuptools import find_packages, setup

LAYERS = ("runtime", "profiles", "exporter", "apps")

setup(
    packages=[
        f"specx.{package}"
        for package in find_packages(include=[*LAYERS, *(f"{layer}.*" for layer in LAYERS)])
    ]
)
