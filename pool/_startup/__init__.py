"""The directory ``python -m pool run`` puts first on ``PYTHONPATH`` for the programs it
runs. It holds only ``sitecustomize``, the start-up hook. It is a package so that it
installs with pool; nothing imports it as ``pool._startup``."""
