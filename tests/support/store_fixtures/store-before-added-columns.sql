BEGIN TRANSACTION;
CREATE TABLE accepted_versions (
	id INTEGER NOT NULL, 
	annotation_id INTEGER NOT NULL, 
	rater_id VARCHAR(200) NOT NULL, 
	version JSON NOT NULL, 
	accepted_at DATETIME NOT NULL, 
	actor VARCHAR(200) NOT NULL, 
	PRIMARY KEY (id)
);
INSERT INTO "accepted_versions" VALUES(1,1,'accepted_versions-rater_id-1','{"row": 1, "name": "version", "values": {"warmth": 1}}','2026-11-21 12:00:01.000000','accepted_versions-actor-1');
INSERT INTO "accepted_versions" VALUES(2,2,'accepted_versions-rater_id-2','{"row": 2, "name": "version", "values": {"warmth": 2}}','2026-11-22 12:00:02.000000','accepted_versions-actor-2');
CREATE TABLE annotations (
	annotation_id INTEGER NOT NULL, 
	task_id INTEGER NOT NULL, 
	conversation_id VARCHAR(200) NOT NULL, 
	turn_index INTEGER, 
	rater_id VARCHAR(200), 
	updated_at VARCHAR(64) NOT NULL, 
	expectation VARCHAR(32), 
	comment TEXT, 
	deleted BOOLEAN NOT NULL, 
	PRIMARY KEY (annotation_id)
);
INSERT INTO "annotations" VALUES(1,1,'annotations-conversation_id-1',1,'annotations-rater_id-1','annotations-updated_at-1','annotations-expectation-1','annotations-comment-1',1);
INSERT INTO "annotations" VALUES(2,2,'annotations-conversation_id-2',2,'annotations-rater_id-2','annotations-updated_at-2','annotations-expectation-2','annotations-comment-2',0);
CREATE TABLE contexts (
	conversation_id VARCHAR(200) NOT NULL, 
	rater_id VARCHAR(200) NOT NULL, 
	context JSON NOT NULL, 
	PRIMARY KEY (conversation_id, rater_id)
);
INSERT INTO "contexts" VALUES('contexts-conversation_id-1','contexts-rater_id-1','{"row": 1, "name": "context", "values": {"warmth": 1}}');
INSERT INTO "contexts" VALUES('contexts-conversation_id-2','contexts-rater_id-2','{"row": 2, "name": "context", "values": {"warmth": 2}}');
CREATE TABLE conversation_choices (
	rater_id VARCHAR(200) NOT NULL, 
	conversation_id VARCHAR(200) NOT NULL, 
	in_study BOOLEAN NOT NULL, 
	in_release BOOLEAN NOT NULL, 
	chosen_at DATETIME NOT NULL, 
	PRIMARY KEY (rater_id, conversation_id)
);
INSERT INTO "conversation_choices" VALUES('conversation_choices-rater_id-1','conversation_choices-conversation_id-1',1,1,'2026-11-21 12:00:01.000000');
INSERT INTO "conversation_choices" VALUES('conversation_choices-rater_id-2','conversation_choices-conversation_id-2',0,0,'2026-11-22 12:00:02.000000');
CREATE TABLE conversations (
	conversation_id VARCHAR(200) NOT NULL, 
	messages JSON NOT NULL, 
	PRIMARY KEY (conversation_id)
);
INSERT INTO "conversations" VALUES('conversations-conversation_id-1','{"row": 1, "name": "messages", "values": {"warmth": 1}}');
INSERT INTO "conversations" VALUES('conversations-conversation_id-2','{"row": 2, "name": "messages", "values": {"warmth": 2}}');
CREATE TABLE crowd_completions (
	rater_id VARCHAR(200) NOT NULL, 
	study_id VARCHAR(100) NOT NULL, 
	platform_id VARCHAR(100) NOT NULL, 
	platform_study VARCHAR(100), 
	platform_session VARCHAR(100), 
	outcome VARCHAR(20) NOT NULL, 
	entered_at DATETIME NOT NULL, 
	ended_at DATETIME, 
	PRIMARY KEY (rater_id)
);
INSERT INTO "crowd_completions" VALUES('crowd_completions-rater_id-1','crowd_completions-study_id-1','crowd_completions-platform_id-1','crowd_completions-platform_study-1','crowd_completions-platform_session-1','crowd_completions-outcome-1','2026-11-21 12:00:01.000000','2026-11-21 12:00:01.000000');
INSERT INTO "crowd_completions" VALUES('crowd_completions-rater_id-2','crowd_completions-study_id-2','crowd_completions-platform_id-2','crowd_completions-platform_study-2','crowd_completions-platform_session-2','crowd_completions-outcome-2','2026-11-22 12:00:02.000000','2026-11-22 12:00:02.000000');
CREATE TABLE crowd_participants (
	rater_id VARCHAR(200) NOT NULL, 
	study_id VARCHAR(100) NOT NULL, 
	state VARCHAR(20) NOT NULL, 
	seat INTEGER, 
	consent VARCHAR(10) NOT NULL, 
	consent_version VARCHAR(64) NOT NULL, 
	consent_at DATETIME NOT NULL, 
	resume_hash VARCHAR(64), 
	check_attempts INTEGER NOT NULL, 
	lease_until DATETIME, 
	ended_at DATETIME, 
	PRIMARY KEY (rater_id), 
	UNIQUE (study_id, seat), 
	UNIQUE (resume_hash)
);
INSERT INTO "crowd_participants" VALUES('crowd_participants-rater_id-1','crowd_participants-study_id-1','crowd_participants-state-1',1,'crowd_participants-consent-1','crowd_participants-consent_version-1','2026-11-21 12:00:01.000000','crowd_participants-resume_hash-1',1,'2026-11-21 12:00:01.000000','2026-11-21 12:00:01.000000');
INSERT INTO "crowd_participants" VALUES('crowd_participants-rater_id-2','crowd_participants-study_id-2','crowd_participants-state-2',2,'crowd_participants-consent-2','crowd_participants-consent_version-2','2026-11-22 12:00:02.000000','crowd_participants-resume_hash-2',2,'2026-11-22 12:00:02.000000','2026-11-22 12:00:02.000000');
CREATE TABLE crowd_pool (
	study_id VARCHAR(100) NOT NULL, 
	conversation_id VARCHAR(200) NOT NULL, 
	turns INTEGER NOT NULL, 
	context JSON NOT NULL, 
	PRIMARY KEY (study_id, conversation_id)
);
INSERT INTO "crowd_pool" VALUES('crowd_pool-study_id-1','crowd_pool-conversation_id-1',1,'{"row": 1, "name": "context", "values": {"warmth": 1}}');
INSERT INTO "crowd_pool" VALUES('crowd_pool-study_id-2','crowd_pool-conversation_id-2',2,'{"row": 2, "name": "context", "values": {"warmth": 2}}');
CREATE TABLE crowd_released (
	id INTEGER NOT NULL, 
	study_id VARCHAR(100) NOT NULL, 
	conversation_id VARCHAR(200) NOT NULL, 
	rater_id VARCHAR(200) NOT NULL, 
	released_at DATETIME NOT NULL, 
	PRIMARY KEY (id)
);
INSERT INTO "crowd_released" VALUES(1,'crowd_released-study_id-1','crowd_released-conversation_id-1','crowd_released-rater_id-1','2026-11-21 12:00:01.000000');
INSERT INTO "crowd_released" VALUES(2,'crowd_released-study_id-2','crowd_released-conversation_id-2','crowd_released-rater_id-2','2026-11-22 12:00:02.000000');
CREATE TABLE crowd_slots (
	study_id VARCHAR(100) NOT NULL, 
	conversation_id VARCHAR(200) NOT NULL, 
	slot INTEGER NOT NULL, 
	rater_id VARCHAR(200) NOT NULL, 
	taken_at DATETIME NOT NULL, 
	done_at DATETIME, 
	PRIMARY KEY (study_id, conversation_id, slot), 
	UNIQUE (study_id, conversation_id, rater_id)
);
INSERT INTO "crowd_slots" VALUES('crowd_slots-study_id-1','crowd_slots-conversation_id-1',1,'crowd_slots-rater_id-1','2026-11-21 12:00:01.000000','2026-11-21 12:00:01.000000');
INSERT INTO "crowd_slots" VALUES('crowd_slots-study_id-2','crowd_slots-conversation_id-2',2,'crowd_slots-rater_id-2','2026-11-22 12:00:02.000000','2026-11-22 12:00:02.000000');
CREATE TABLE crowd_studies (
	study_id VARCHAR(100) NOT NULL, 
	config JSON NOT NULL, 
	is_open BOOLEAN NOT NULL, 
	updated_at DATETIME NOT NULL, 
	PRIMARY KEY (study_id)
);
INSERT INTO "crowd_studies" VALUES('crowd_studies-study_id-1','{"row": 1, "name": "config", "values": {"warmth": 1}}',1,'2026-11-21 12:00:01.000000');
INSERT INTO "crowd_studies" VALUES('crowd_studies-study_id-2','{"row": 2, "name": "config", "values": {"warmth": 2}}',0,'2026-11-22 12:00:02.000000');
CREATE TABLE crowd_withdrawn (
	study_id VARCHAR(100) NOT NULL, 
	id_hash VARCHAR(64) NOT NULL, 
	PRIMARY KEY (study_id, id_hash)
);
INSERT INTO "crowd_withdrawn" VALUES('crowd_withdrawn-study_id-1','crowd_withdrawn-id_hash-1');
INSERT INTO "crowd_withdrawn" VALUES('crowd_withdrawn-study_id-2','crowd_withdrawn-id_hash-2');
CREATE TABLE imported_ratings (
	conversation_id VARCHAR(200) NOT NULL, 
	turn_index INTEGER NOT NULL, 
	rater_id VARCHAR(200) NOT NULL, 
	dimension VARCHAR(100) NOT NULL, 
	rating INTEGER NOT NULL, 
	PRIMARY KEY (conversation_id, turn_index, rater_id, dimension)
);
INSERT INTO "imported_ratings" VALUES('imported_ratings-conversation_id-1',1,'imported_ratings-rater_id-1','imported_ratings-dimension-1',1);
INSERT INTO "imported_ratings" VALUES('imported_ratings-conversation_id-2',2,'imported_ratings-rater_id-2','imported_ratings-dimension-2',2);
CREATE TABLE instructed_answers (
	rater_id VARCHAR(200) NOT NULL, 
	task_id INTEGER NOT NULL, 
	item VARCHAR(100) NOT NULL, 
	answered INTEGER NOT NULL, 
	expected INTEGER NOT NULL, 
	answered_at DATETIME NOT NULL, 
	PRIMARY KEY (rater_id, task_id)
);
INSERT INTO "instructed_answers" VALUES('instructed_answers-rater_id-1',1,'instructed_answers-item-1',1,1,'2026-11-21 12:00:01.000000');
INSERT INTO "instructed_answers" VALUES('instructed_answers-rater_id-2',2,'instructed_answers-item-2',2,2,'2026-11-22 12:00:02.000000');
CREATE TABLE rater_links (
	rater_id VARCHAR(200) NOT NULL, 
	token_hash VARCHAR(64) NOT NULL, 
	created_at DATETIME NOT NULL, 
	revoked_at DATETIME, 
	PRIMARY KEY (rater_id), 
	UNIQUE (token_hash)
);
INSERT INTO "rater_links" VALUES('rater_links-rater_id-1','rater_links-token_hash-1','2026-11-21 12:00:01.000000','2026-11-21 12:00:01.000000');
INSERT INTO "rater_links" VALUES('rater_links-rater_id-2','rater_links-token_hash-2','2026-11-22 12:00:02.000000','2026-11-22 12:00:02.000000');
CREATE TABLE rater_tasks (
	task_id INTEGER NOT NULL, 
	rater_id VARCHAR(200) NOT NULL, 
	kind VARCHAR(16) NOT NULL, 
	position INTEGER NOT NULL, 
	conversation_id VARCHAR(200), 
	turn_index INTEGER, 
	data JSON NOT NULL, 
	prediction JSON, 
	answer JSON, 
	PRIMARY KEY (task_id)
);
INSERT INTO "rater_tasks" VALUES(1,'rater_tasks-rater_id-1','rater_tasks-kind-1',1,'rater_tasks-conversation_id-1',1,'{"row": 1, "name": "data", "values": {"warmth": 1}}','{"row": 1, "name": "prediction", "values": {"warmth": 1}}','{"row": 1, "name": "answer", "values": {"warmth": 1}}');
INSERT INTO "rater_tasks" VALUES(2,'rater_tasks-rater_id-2','rater_tasks-kind-2',2,'rater_tasks-conversation_id-2',2,'{"row": 2, "name": "data", "values": {"warmth": 2}}','{"row": 2, "name": "prediction", "values": {"warmth": 2}}','{"row": 2, "name": "answer", "values": {"warmth": 2}}');
CREATE TABLE raters (
	rater_id VARCHAR(200) NOT NULL, 
	email VARCHAR(320), 
	traits JSON NOT NULL, 
	updated_at DATETIME NOT NULL, 
	PRIMARY KEY (rater_id), 
	UNIQUE (email)
);
INSERT INTO "raters" VALUES('raters-rater_id-1','raters-email-1','{"row": 1, "name": "traits", "values": {"warmth": 1}}','2026-11-21 12:00:01.000000');
INSERT INTO "raters" VALUES('raters-rater_id-2','raters-email-2','{"row": 2, "name": "traits", "values": {"warmth": 2}}','2026-11-22 12:00:02.000000');
CREATE TABLE rating_history (
	id INTEGER NOT NULL, 
	annotation_id INTEGER NOT NULL, 
	task_id INTEGER, 
	change VARCHAR(16) NOT NULL, 
	changed_by INTEGER, 
	changed_at DATETIME NOT NULL, 
	ls_updated_at VARCHAR(64), 
	old JSON, 
	new JSON, 
	PRIMARY KEY (id)
);
INSERT INTO "rating_history" VALUES(1,1,1,'rating_history-change-1',1,'2026-11-21 12:00:01.000000','rating_history-ls_updated_at-1','{"row": 1, "name": "old", "values": {"warmth": 1}}','{"row": 1, "name": "new", "values": {"warmth": 1}}');
INSERT INTO "rating_history" VALUES(2,2,2,'rating_history-change-2',2,'2026-11-22 12:00:02.000000','rating_history-ls_updated_at-2','{"row": 2, "name": "old", "values": {"warmth": 2}}','{"row": 2, "name": "new", "values": {"warmth": 2}}');
CREATE TABLE ratings (
	annotation_id INTEGER NOT NULL, 
	control VARCHAR(100) NOT NULL, 
	value INTEGER NOT NULL, 
	PRIMARY KEY (annotation_id, control)
);
INSERT INTO "ratings" VALUES(1,'ratings-control-1',1);
INSERT INTO "ratings" VALUES(2,'ratings-control-2',2);
CREATE TABLE recorded_predictions (
	task_key VARCHAR(400) NOT NULL, 
	version VARCHAR(100) NOT NULL, 
	rater_id VARCHAR(200) NOT NULL, 
	conversation_id VARCHAR(200) NOT NULL, 
	turn_index INTEGER NOT NULL, 
	arm VARCHAR(16) NOT NULL, 
	kind VARCHAR(16) NOT NULL, 
	levels JSON NOT NULL, 
	expected JSON NOT NULL, 
	generic_levels JSON NOT NULL, 
	generic_expected JSON NOT NULL, 
	recorded_at DATETIME NOT NULL, 
	PRIMARY KEY (task_key, version)
);
INSERT INTO "recorded_predictions" VALUES('recorded_predictions-task_key-1','recorded_predictions-version-1','recorded_predictions-rater_id-1','recorded_predictions-conversation_id-1',1,'recorded_predictions-arm-1','recorded_predictions-kind-1','{"row": 1, "name": "levels", "values": {"warmth": 1}}','{"row": 1, "name": "expected", "values": {"warmth": 1}}','{"row": 1, "name": "generic_levels", "values": {"warmth": 1}}','{"row": 1, "name": "generic_expected", "values": {"warmth": 1}}','2026-11-21 12:00:01.000000');
INSERT INTO "recorded_predictions" VALUES('recorded_predictions-task_key-2','recorded_predictions-version-2','recorded_predictions-rater_id-2','recorded_predictions-conversation_id-2',2,'recorded_predictions-arm-2','recorded_predictions-kind-2','{"row": 2, "name": "levels", "values": {"warmth": 2}}','{"row": 2, "name": "expected", "values": {"warmth": 2}}','{"row": 2, "name": "generic_levels", "values": {"warmth": 2}}','{"row": 2, "name": "generic_expected", "values": {"warmth": 2}}','2026-11-22 12:00:02.000000');
CREATE TABLE staff_log (
	id INTEGER NOT NULL, 
	at DATETIME NOT NULL, 
	actor VARCHAR(200) NOT NULL, 
	action VARCHAR(100) NOT NULL, 
	detail JSON NOT NULL, 
	PRIMARY KEY (id)
);
INSERT INTO "staff_log" VALUES(1,'2026-11-21 12:00:01.000000','staff_log-actor-1','staff_log-action-1','{"row": 1, "name": "detail", "values": {"warmth": 1}}');
INSERT INTO "staff_log" VALUES(2,'2026-11-22 12:00:02.000000','staff_log-actor-2','staff_log-action-2','{"row": 2, "name": "detail", "values": {"warmth": 2}}');
CREATE TABLE study_values (
	name VARCHAR(100) NOT NULL, 
	value VARCHAR(300) NOT NULL, 
	PRIMARY KEY (name)
);
INSERT INTO "study_values" VALUES('study_values-name-1','study_values-value-1');
INSERT INTO "study_values" VALUES('study_values-name-2','study_values-value-2');
CREATE TABLE submissions (
	"key" VARCHAR(300) NOT NULL, 
	rater_id VARCHAR(200) NOT NULL, 
	kind VARCHAR(16) NOT NULL, 
	task_id INTEGER NOT NULL, 
	revision INTEGER NOT NULL, 
	result JSON NOT NULL, 
	answer JSON NOT NULL, 
	lead_time FLOAT, 
	submitted_at DATETIME NOT NULL, 
	delivered_at DATETIME, 
	annotation_id INTEGER, 
	attempts INTEGER NOT NULL, 
	last_error VARCHAR(300), 
	PRIMARY KEY ("key")
);
INSERT INTO "submissions" VALUES('submissions-key-1','submissions-rater_id-1','submissions-kind-1',1,1,'{"row": 1, "name": "result", "values": {"warmth": 1}}','{"row": 1, "name": "answer", "values": {"warmth": 1}}',1.5,'2026-11-21 12:00:01.000000','2026-11-21 12:00:01.000000',1,1,'submissions-last_error-1');
INSERT INTO "submissions" VALUES('submissions-key-2','submissions-rater_id-2','submissions-kind-2',2,2,'{"row": 2, "name": "result", "values": {"warmth": 2}}','{"row": 2, "name": "answer", "values": {"warmth": 2}}',2.5,'2026-11-22 12:00:02.000000','2026-11-22 12:00:02.000000',2,2,'submissions-last_error-2');
CREATE TABLE task_arms (
	task_key VARCHAR(400) NOT NULL, 
	conversation_id VARCHAR(200) NOT NULL, 
	turn_index INTEGER NOT NULL, 
	rater_id VARCHAR(200) NOT NULL, 
	arm VARCHAR(16) NOT NULL, 
	policy VARCHAR(16) NOT NULL, 
	shown_share FLOAT NOT NULL, 
	seed VARCHAR(64) NOT NULL, 
	repeat_of VARCHAR(400), 
	drawn_at DATETIME NOT NULL, 
	PRIMARY KEY (task_key)
);
INSERT INTO "task_arms" VALUES('task_arms-task_key-1','task_arms-conversation_id-1',1,'task_arms-rater_id-1','task_arms-arm-1','task_arms-policy-1',1.5,'task_arms-seed-1','task_arms-repeat_of-1','2026-11-21 12:00:01.000000');
INSERT INTO "task_arms" VALUES('task_arms-task_key-2','task_arms-conversation_id-2',2,'task_arms-rater_id-2','task_arms-arm-2','task_arms-policy-2',2.5,'task_arms-seed-2','task_arms-repeat_of-2','2026-11-22 12:00:02.000000');
CREATE TABLE withdrawals (
	receipt VARCHAR(32) NOT NULL, 
	rater_id VARCHAR(200), 
	requested_by VARCHAR(200) NOT NULL, 
	requested_at DATETIME NOT NULL, 
	confirmed_by VARCHAR(200), 
	erased_at DATETIME, 
	counts JSON, 
	model_versions JSON, 
	retrain VARCHAR(300), 
	PRIMARY KEY (receipt), 
	UNIQUE (rater_id)
);
INSERT INTO "withdrawals" VALUES('withdrawals-receipt-1','withdrawals-rater_id-1','withdrawals-requested_by-1','2026-11-21 12:00:01.000000','withdrawals-confirmed_by-1','2026-11-21 12:00:01.000000','{"row": 1, "name": "counts", "values": {"warmth": 1}}','{"row": 1, "name": "model_versions", "values": {"warmth": 1}}','withdrawals-retrain-1');
INSERT INTO "withdrawals" VALUES('withdrawals-receipt-2','withdrawals-rater_id-2','withdrawals-requested_by-2','2026-11-22 12:00:02.000000','withdrawals-confirmed_by-2','2026-11-22 12:00:02.000000','{"row": 2, "name": "counts", "values": {"warmth": 2}}','{"row": 2, "name": "model_versions", "values": {"warmth": 2}}','withdrawals-retrain-2');
CREATE INDEX ix_rating_history_annotation_id ON rating_history (annotation_id);
CREATE INDEX ix_accepted_versions_annotation_id ON accepted_versions (annotation_id);
CREATE INDEX ix_rater_tasks_rater_id ON rater_tasks (rater_id);
CREATE INDEX ix_submissions_task_id ON submissions (task_id);
CREATE INDEX ix_submissions_rater_id ON submissions (rater_id);
CREATE INDEX ix_task_arms_rater_id ON task_arms (rater_id);
CREATE INDEX ix_recorded_predictions_rater_id ON recorded_predictions (rater_id);
CREATE INDEX ix_crowd_participants_study_id ON crowd_participants (study_id);
CREATE INDEX ix_crowd_slots_rater_id ON crowd_slots (rater_id);
CREATE INDEX ix_crowd_released_study_id ON crowd_released (study_id);
CREATE INDEX ix_crowd_completions_study_id ON crowd_completions (study_id);
COMMIT;
