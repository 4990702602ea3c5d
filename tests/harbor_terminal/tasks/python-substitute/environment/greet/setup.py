from setuptools import setup

setup(name="greet", version="1.0", py_modules=["greet"])
