"""Synthetic data: whole synthetic studies (`synth`) and the jobs' small warm and cold study (`toy_study`),
for the demo, the tests and the benchmarks."""
