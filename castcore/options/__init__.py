"""castcore's options, declared once (catalog) as Option objects (option): the command line, the sweep spec, the
Python API and the documentation are all made from them. Torch-free."""
