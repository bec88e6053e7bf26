"""What every command reports, as plain data: metadata, a list of buckets and how to show them
(no torch). `contract` holds the output contract every command shares; `draws` the figures over
repeated draws; `evaluation`, `comparison` and `runs` each command group's report.
"""

from .comparison import (  # noqa: F401
    DIFFICULTY_KEYS,
    Group,
    compare_columns,
    comparison_report,
    group_by_configuration,
    mean_and_sd,
    plus_minus,
)
from .contract import META_KEYS, Report, TaskView, Terms, describe_model, make_meta  # noqa: F401
from .draws import combine_draws, mean_ci  # noqa: F401
from .evaluation import (  # noqa: F401
    CALIBRATION_COLUMNS,
    SWEEP_COLUMNS,
    accuracy_column,
    bucket_columns,
    calibration_report,
    evaluation_report,
    least_squares,
    per_bucket,
    per_step_table,
    sweep_columns,
    sweep_report,
)
from .runs import (HISTORY_COLUMNS, PREDICT_COLUMNS, RUNS_COLUMNS, TRAIN_COLUMNS, info_report,  # noqa: F401
                   prediction_report, runs_report, training_report)
