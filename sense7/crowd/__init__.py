"""Crowd studies: strangers recruited on a platform (Prolific) arrive through one study URL, consent, pass a
comprehension check, rate a balanced share of a pool of conversations under a pseudonymous rater id, and
return with a completion code.

`study` reads and validates the study file; `participants` owns who entered (pseudonymous ids, resume
codes, consent, the check, the completions table: the only place platform ids are kept); `assignment` the
overlap control (a pure policy and its store-backed owner). Nothing here talks to Label Studio: the worker
creates the assigned tasks (sense7.tasks.crowd_jobs), the rater page serves the flow (sense7.rater_page.crowd_pages).
"""
