"""Sphinx configuration of metalearn's documentation site.

Build it (``pip install '.[docs]'``)::

    python -m sphinx -W --keep-going docs docs/_build/html

Warnings are errors: a broken cross-reference, an example that raises, or a public name without
a docstring fails the build (:func:`check_docstrings`).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent / "_ext"))

project = "metalearn"
author = "the metalearn developers"
copyright = "2026, the metalearn developers"  # noqa: A001 (Sphinx's name)

extensions = [
    "myst_nb",  # Markdown pages; the examples' pages are executed when the site builds
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.viewcode",
    "config_reference",  # the command line's settings, generated from the config dataclasses
]

exclude_patterns = ["_build", "_ext", "Thumbs.db", ".DS_Store", "jupyter_execute"]
html_theme = "sphinx_book_theme"
html_title = "metalearn"
html_theme_options = {"show_toc_level": 2}

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
# Every page with code cells runs, top to bottom, in a fresh kernel at each build; a cell that
# raises fails the build.
nb_execution_mode = "force"
nb_execution_raise_on_error = True
nb_execution_timeout = 600
nb_execution_show_tb = True

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
nitpicky = True
# The site is built offline, so other projects' types cannot be linked (no intersphinx): a
# reference to one is not a broken reference of ours.
nitpick_ignore_regex = [
    (
        r"py:.*",
        r"(jax|jaxlib|optax|flax|numpy|np|jnp|omegaconf|hydra|orbax|chex|etils|tensorflow"
        r"_datasets|typing|typing_extensions|collections|pathlib|os|types|dataclasses|enum"
        r"|contextlib|argparse|logging|threading|signal|concurrent|builtins|abc)(\..*)?",
    ),
    (
        r"py:.*",
        r"(Any|Callable|Sequence|Mapping|Iterable|Iterator|PyTree|Array|ArrayLike|Path"
        r"|Optional|Union|NamedTuple|Protocol|TypeVar|ClassVar|Literal|Self|T|F)",
    ),
    (
        r"py:class",
        r"(int|float|str|bool|bytes|dict|list|tuple|set|object|type|None"
        r"|Exception|ValueError|RuntimeError|TypeError|BaseException)",
    ),
    (r"py:class", r"'?Callable\[.*|traceback\..*"),
    # Type aliases of ours in annotations (``Metrics = dict[str, jax.Array]``): names, not objects.
    (r"py:class", r"(Params|State|Metrics|Apply|TaskLoss|PolicyApply|RLObjective|Aux)"),
    # Flax's own methods, named in the docstrings that Flax modules inherit.
    (r"py:(meth|attr)", r"(init|apply|compact|init_and_output|__setattr__|bind|new)"),
]

# The public API: each module's ``__all__`` is documented on the reference pages (api/*.md),
# and every name in it must have a docstring of its own.
PUBLIC_MODULES = [
    "metalearn",
    "metalearn.algorithms",
    "metalearn.data",
    "metalearn.data.task",
    "metalearn.data.sinusoid",
    "metalearn.models",
    "metalearn.models.base",
    "metalearn.rl",
    "metalearn.rl.envs",
    "metalearn.runner",
    "metalearn.runner.steps",
    "metalearn.config",
    "metalearn.registry",
]


def public_names(module_name: str) -> list[str]:
    """``__all__``, or the module's own public functions and classes when it declares none."""
    module = importlib.import_module(module_name)
    if hasattr(module, "__all__"):
        return list(module.__all__)
    return [
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and (inspect.isfunction(value) or inspect.isclass(value))
        and value.__module__ == module_name
    ]


def check_docstrings(app: Any) -> None:
    """A warning (so, with ``-W``, an error) for each public name without a docstring."""
    from sphinx.util import logging

    log = logging.getLogger("metalearn.docs")
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in public_names(module_name):
            value = getattr(module, name)  # a constant has its type's docstring: not asked
            if callable(value) and not (value.__doc__ or "").strip():
                log.warning(f"{module_name}.{name} has no docstring: give it one")


# The reference pages (api/*.md): each package's public names under the package (where users
# import them), then each module's own names that its package does not re-export, so that every
# object has one entry and a reference to it one target.
API_PAGES = {
    "core": ("The meta-gradient", ["metalearn"], "core", "inner_loop autodiff curvature batching"),
    "algorithms": (
        "Algorithms",
        ["metalearn.algorithms"],
        "algorithms",
        "base maml anil boil cavia meta_sgd mamlpp imaml reptile protonet r2d2 metaoptnet baseline "
        "embedding",
    ),
    "data": (
        "Task families",
        ["metalearn.data"],
        "data",
        "task sinusoid episodes episode_settings image_families class_split omniglot miniimagenet "
        "cifar sources family_checks objective_checks",
    ),
    "models": (
        "Models",
        ["metalearn.models"],
        "models",
        "base mlp conv4 resnet12 rrnet patch_conv dropblock weighted_losses",
    ),
    "rl": (
        "Meta-reinforcement learning",
        ["metalearn.rl", "metalearn.rl.envs"],
        "rl",
        "algorithm maml_rl inner estimators trpo ppo baseline policy policy_model rollout family "
        "lapack probe envs.base envs.nav2d",
    ),
    "runner": (
        "The runner",
        ["metalearn.runner"],
        "runner",
        "plan experiment steps loop run evaluation metalearn.statistics rundir layout checkpoints "
        "saved_run devices cpu_backend compilation_cache signals divergence preflight reporting "
        "sweeps",
    ),
    "config": (
        "Config and registries",
        ["metalearn.config"],
        "config",
        "schema compose metalearn.registry",
    ),
}


def own_members(module_name: str, exported: set[int]) -> list[tuple[str, str]]:
    """``(directive, name)`` for each public function, class and constant defined in the module
    and not re-exported by a package (``exported``: the ids of those objects)."""
    module = importlib.import_module(module_name)
    tree = ast.parse(inspect.getsource(module))
    assigned = {
        target.id
        for node in tree.body
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name)
    }
    found = []
    for name, value in vars(module).items():
        if name.startswith("_") or id(value) in exported:
            continue
        if inspect.isclass(value) and value.__module__ == module_name:
            found.append(("autoclass", name))
        elif inspect.isfunction(value) and value.__module__ == module_name:
            found.append(("autofunction", name))
        elif name.isupper() and name in assigned:
            found.append(("py:data", name))
    return found


def write_api_pages(app: Any) -> None:
    out = Path(app.srcdir) / "api"
    for page, (title, packages, folder, modules) in API_PAGES.items():
        lines = [f"# {title}", "", "Generated from the docstrings when the site builds.", ""]
        exported: set[int] = set()
        for package in packages:
            lines += [f"## `{package}`", "", "```{eval-rst}", f".. automodule:: {package}"]
            lines += ["   :members:", "   :undoc-members:", ""]
            for name in public_names(package):
                value = getattr(importlib.import_module(package), name)
                exported.add(id(value))
                # Constants have no docstring for autodoc to find: an entry each, by name.
                if not (callable(value) or inspect.ismodule(value)):
                    lines += [f".. py:data:: {name}", ""]
            lines += ["```", ""]
        for short in modules.split():
            module = short if short.startswith("metalearn.") else f"metalearn.{folder}.{short}"
            parent, _, leaf = module.rpartition(".")
            # metalearn.algorithms.maml is a module and the package's function: the module's
            # section shows its docstring without an entry of its own.
            importlib.import_module(module)
            shadowed = not inspect.ismodule(getattr(importlib.import_module(parent), leaf))
            lines += [f"## `{module}`", "", "```{eval-rst}", f".. automodule:: {module}"]
            lines += ["   :no-index:" if shadowed else "", ""]
            lines += [f".. py:currentmodule:: {module}", ""]
            for directive, name in own_members(module, exported):
                option = "   :members:" if directive == "autoclass" else ""
                lines += [f".. {directive}:: {name}", option, ""]
            lines += ["```", ""]
        text = "\n".join(lines)
        path = out / f"{page}.md"
        if not path.exists() or path.read_text() != text:
            path.write_text(text)


def locate(path: str, module: str | None = None) -> Any:
    """The object a dotted name stands for, looked up in ``module`` first; None if none."""
    for candidate in ([f"{module}.{path}"] if module else []) + [path]:
        parts = candidate.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                value = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            try:
                for attr in parts[cut:]:
                    value = getattr(value, attr)
            except AttributeError:
                break
            return value
    return None


def resolve_by_object(app: Any, env: Any, node: Any, contnode: Any) -> Any:
    """A Python reference by a name other than its entry's (``model_from_flax`` written in
    ``metalearn.models.base``, documented as ``metalearn.models.model_from_flax``) links to the
    entry of the same object; a module without a section of its own is left as text. Anything
    else stays a broken reference (an error under ``-W``)."""
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"].lstrip("~.")
    value = locate(target, node.get("py:module"))
    if value is None and "." not in target:
        # Written in a module whose names are documented under its package: the one object of
        # that name in metalearn's modules, if there is exactly one.
        found = {
            id(getattr(module, target)): getattr(module, target)
            for name, module in list(sys.modules.items())
            if name.startswith("metalearn") and hasattr(module, target)
        }
        value = next(iter(found.values())) if len(found) == 1 else None
    if value is None:
        return None
    domain = env.get_domain("py")
    # On the application, not the environment: the environment is pickled for the next build,
    # where these object ids mean nothing.
    if not hasattr(app, "metalearn_entries"):
        app.metalearn_entries = {}
        for name in domain.objects:
            app.metalearn_entries.setdefault(id(locate(name)), name)
    name = app.metalearn_entries.get(id(value))
    if name is None:
        return contnode if inspect.ismodule(value) else None
    return domain.resolve_xref(env, node["refdoc"], app.builder, "obj", name, node, contnode)


def setup(app: Any) -> None:
    app.connect("missing-reference", resolve_by_object)
    app.connect("builder-inited", write_api_pages)
    app.connect("builder-inited", check_docstrings)
