"""Participants' privacy and what is published: personal details removed (`pii`), participants' choices and
withdrawals (`participation`), the anonymized release (`release`), its check (`release_check`) and its
Croissant metadata (`croissant`)."""
