"""The demo project as an egg for scrapyd (``scrapyd-deploy`` uses this file instead of generating one).

Only Python files travel in an egg unless listed here: the policy file is
package data, read from the egg as ``pkg://demo_project/openclaw.yaml``.
"""

from setuptools import find_packages, setup

setup(
    name="demo_project",
    version="1.0",
    packages=find_packages(),
    package_data={"demo_project": ["openclaw.yaml"]},
    entry_points={"scrapy": ["settings = demo_project.settings"]},
    zip_safe=True,
)
