"""sense7's own store: the schema (`tables`), the `Store` class over it (`database`), and the code that owns
a table's rows (`study_design`, `rater_page_tables`, `rater_answers`)."""
