from trialbox.cli import main

main()
