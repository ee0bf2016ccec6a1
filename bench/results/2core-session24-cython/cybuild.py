import sys
from setuptools import setup
from Cython.Build import cythonize
mods = sys.argv[1:]
sys.argv = [sys.argv[0], "build_ext", "--inplace", "-q"]
setup(ext_modules=cythonize(mods, language_level=3, quiet=True, nthreads=2,
      compiler_directives={"binding": True, "annotation_typing": False}))
