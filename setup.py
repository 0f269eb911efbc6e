"""Installs the top-level folders as one import namespace: ``client/`` as
``meancache.client`` and so on. The project's metadata is in pyproject.toml; only the
package map, which pyproject.toml cannot compute, is here."""

from setuptools import find_packages, setup

SIDES = ("shared", "client", "upstream", "fl_server")

setup(
    package_dir={"meancache": "meancache", **{f"meancache.{side}": side for side in SIDES}},
    packages=["meancache", *(f"meancache.{name}" for name in
                             find_packages(include=[f"{side}*" for side in SIDES]))],
    # The Flower app declaration `meancache fl run|simulate` submit (no code in it).
    package_data={"meancache.fl_server": ["flower_app/pyproject.toml"],
                  # the learned verifier: int8 ONNX and its card (sha256, threshold)
                  # and the learned decision's card (coefficients, threshold, sha256)
                  "meancache.shared": ["verifier/artefact/verifier.onnx",
                                       "verifier/artefact/verifier.json",
                                       "verifier/decision.json"]},
)
