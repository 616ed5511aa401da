# All metadata lives in setup.cfg; this shim keeps `pip install -e .` working with older tooling.
from setuptools import setup

setup()
