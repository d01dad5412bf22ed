"""deep_spin.py run the way `python -m` runs a module, through runpy: its
frames (run_path, _run_module_code, _run_code) sit under deep_spin's.
3.11 and 3.12 compile runpy's code objects into the interpreter."""
import os
import runpy

runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "deep_spin.py"), run_name="__main__")
