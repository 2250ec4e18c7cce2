"""The package as `pip install ./python` installs it: the C library inside the package (no
environment variable, no `sys.path` edit), type information (`py.typed`), and versions that
agree."""

import os
import unittest
from pathlib import Path

import portcullis
from portcullis import _lib

PACKAGE = Path(portcullis.__file__).resolve().parent
SOURCE = Path(__file__).resolve().parents[1] / "portcullis"


@unittest.skipIf(PACKAGE == SOURCE, "run from the source tree, not from an installed package")
class InstalledTest(unittest.TestCase):
    def test_the_library_is_the_one_installed_with_the_package(self):
        bundled = _lib.bundled()
        self.assertIsNotNone(bundled, f"no {_lib.NATIVE} library in {PACKAGE}")
        self.assertEqual(bundled.parent, PACKAGE)
        if not os.environ.get(_lib.ENV_VAR):
            self.assertEqual(Path(_lib.dll._name).resolve(), bundled.resolve())

    def test_type_information_is_installed(self):
        self.assertTrue((PACKAGE / "py.typed").is_file())


class VersionTest(unittest.TestCase):
    def test_the_library_and_the_package_agree(self):
        self.assertEqual(portcullis.abi_version(), _lib.ABI_VERSION)
        self.assertEqual(portcullis.library_version(), portcullis.__version__)
