"""The SM90 GEMM's device code that both kernels share: conversion and loads (``common``,
``f16``), the small launches before a GEMM (``refs``, ``tokens``), the W8A16 slice loads and
entry (``slices``). Each imports cutlass: load lazily."""
