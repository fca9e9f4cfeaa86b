"""The data the pipeline starts from: the source lock (``lock``) and the build matrix (``configs``)."""
