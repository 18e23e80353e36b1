"""What GPUs cost and who pays: GPU counts and models (``gpus``), idle GPU-hours (``idle``), teams (``teams``),
prices and their periods (``prices``), closed months (``closing``) and the ``costs`` readout. No Dagster here."""
