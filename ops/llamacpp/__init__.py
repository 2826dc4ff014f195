"""llama.cpp on the controller: its source (the llama-cpp-python sdist's vendored tree), a cached build of
llama-server and llama-quantize, and GGUF artifacts of a checkpoint (language model + vision projector).

Nothing of llama.cpp is kept in git: the sdist is fetched with pip into the vlfleet cache and built there.
"""
