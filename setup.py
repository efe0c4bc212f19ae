# Beam's --setup_file packaging for Dataflow workers still wants a setup.py; everything lives in pyproject.toml.
import setuptools

setuptools.setup()
