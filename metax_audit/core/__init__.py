# The records that flow between the stages (models, findings and their rule table, errors, config,
# contracts) and the small helpers every stage uses (source reading, subprocesses, temp dirs); they
# import nothing above them.
