"""The names of sense7's jobs and their modules: the one place they are spelled out.

Senders (the ML backend's webhook hand-off, the CLI, other jobs) use these constants with
`app.send_task(NAME)`, so nothing outside a job's own module needs to import it.
"""

SYNC_PENDING = "sense7.sync_pending"  # drains the annotations webhooks named (coalesced)
SYNC_ANNOTATION = "sense7.sync_annotation"
DELETE_ANNOTATIONS = "sense7.delete_annotations"
RECONCILE = "sense7.reconcile"
RETRAIN = "sense7.retrain"
PREANNOTATE = "sense7.preannotate"
DELIVER = "sense7.deliver_submissions"  # rater-page submissions -> Label Studio annotations
REFRESH_QUEUES = "sense7.refresh_rater_queues"  # raters' queues copied from Label Studio for the rater page
CROWD_PREPARE = "sense7.crowd_prepare"  # a crowd participant's assigned tasks created in Label Studio
EMBED_TEXTS = "sense7.embed_texts"  # conversations' texts embedded once into the store's text vectors
CROWD_EXPIRE = "sense7.crowd_expire_leases"  # crowd leases ended: unfinished conversations back to the pool

JOB_MODULES = ("sense7.tasks.sync", "sense7.tasks.training", "sense7.tasks.preannotate", "sense7.tasks.delivery",
               "sense7.tasks.crowd_jobs", "sense7.tasks.embedding",
               "sense7.tasks.recovery")  # recovery: no job, the worker's start-up hook
