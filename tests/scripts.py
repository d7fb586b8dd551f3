"""A repository script without a .py name (tools/mutate,
loadtest/results-readme), loaded as a module so a test can call its
functions: load(path, name)."""

import importlib.machinery
import importlib.util


def load(path, name):
    loader = importlib.machinery.SourceFileLoader(name, str(path))
    spec = importlib.util.spec_from_loader(name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module
